/*
 * dsa.c -- the DSA indexer of glm5_next's MLA layers: which key pools each token attends.
 *
 * Keys are grouped in pools of P = index_kpool consecutive positions (pool j holds
 * jP..jP+P-1). Per token, from x (the layer's normed input) and q_resid (mla_qa, the
 * rmsnorm'd q_a projection), with D = index_head_dim and NI = index_heads:
 *   k    = LayerNorm(W_k x) (weight, bias, eps 1e-6)          [D]
 *   gate = W_gate x                                           [D]
 *   q_h  = (W_q_b q_resid)_h,  w_h = (W_w x)_h * NI^-1/2       [NI][D], [NI]
 * A pool is a candidate once complete. Its key, per channel c, averages its tokens' k
 * with the weights softmax_i(gate_i[c] + ape[i][c]). Its score for a token:
 *   s_j = sum_h w_h * relu(q_h . key_j * D^-1/2)
 * A token at position p selects the index_topk / P best complete pools ending at or
 * before p (all of them when there are no more; ties to the lower pool), and mla.c adds
 * its own incomplete pool when index_tail. A "shared" layer reuses the selection of the
 * layer before it (idx_sel is left as it is).
 * Cache per indexer layer and position: [k | gate | key of the pool that ends there]
 * (3D floats), so decoding scores the cached pool keys and recomputes nothing. Tokens
 * are independent tasks, so thread count never changes a result.
 */
#include <math.h>
#include <string.h>

#include "blocks.h"

#define MAX_SEL 1024 /* hparams_glm5.c bounds index_topk / index_kpool by this */
#define LN_EPS 1e-6f

uint64_t wpi_dsa_row_floats(const wpi_hparams *hp)
{
    return hp->index_kpool ? 3ull * hp->index_head_dim : 0;
}

uint32_t wpi_dsa_layers(const wpi_hparams *hp)
{
    uint32_t n = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++)
        n += hp->layer_index[l] == WPI_INDEX_FULL && hp->layer_attn[l] != WPI_ATTN_KDA;
    return n;
}

static void layer_norm(float *x, uint32_t n, const float *w, const float *b)
{
    float mean = 0, var = 0;
    for (uint32_t i = 0; i < n; i++) mean += x[i];
    mean /= (float)n;
    for (uint32_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    var /= (float)n;
    const float inv = 1.0f / sqrtf(var + LN_EPS);
    for (uint32_t i = 0; i < n; i++) x[i] = (x[i] - mean) * inv * w[i] + b[i];
}

/* The key of the pool ending at position p, from its tokens' rows, into row p. */
static void pool_key(const wpi_hparams *hp, const float *ape, float *rows, uint32_t p)
{
    const uint32_t D = hp->index_head_dim, P = hp->index_kpool;
    const size_t RW = 3 * (size_t)D;
    const float *first = rows + (size_t)(p + 1 - P) * RW;
    float *key = rows + (size_t)p * RW + 2 * D;
    float e[4096];
    for (uint32_t c = 0; c < D; c++) {
        float mx = -INFINITY, sum = 0, acc = 0;
        for (uint32_t i = 0; i < P; i++) {
            e[i] = first[i * RW + D + c] + ape[(size_t)i * D + c];
            if (e[i] > mx) mx = e[i];
        }
        for (uint32_t i = 0; i < P; i++) sum += (e[i] = expf(e[i] - mx));
        for (uint32_t i = 0; i < P; i++) acc += e[i] / sum * first[i * RW + c];
        key[c] = acc;
    }
}

typedef struct sel_ctx {
    wpi_model *m;
    const float *rows; /* this layer's cache, position 0 */
    uint32_t pos;
} sel_ctx;

static void select_task(void *arg, uint32_t t)
{
    const sel_ctx *a = arg;
    wpi_model *m = a->m;
    const wpi_hparams *hp = m->hp;
    const uint32_t D = hp->index_head_dim, NI = hp->index_heads, P = hp->index_kpool;
    const uint32_t per = hp->index_topk / P, p = a->pos + t, nvis = (p + 1) / P;
    const size_t RW = 3 * (size_t)D;
    int32_t *sel = m->idx_sel + (size_t)t * per;
    if (nvis <= per) {
        for (uint32_t j = 0; j < nvis; j++) sel[j] = (int32_t)j;
        m->idx_nsel[t] = (int32_t)nvis;
        return;
    }
    const float *q = m->idx_q + (size_t)t * NI * D, *w = m->idx_wt + (size_t)t * NI;
    const float scale = 1.0f / sqrtf((float)D);
    float best[MAX_SEL];
    int32_t ids[MAX_SEL];
    uint32_t filled = 0;
    for (uint32_t j = 0; j < nvis; j++) {
        const float *key = a->rows + ((size_t)(j + 1) * P - 1) * RW + 2 * D;
        float s = 0;
        for (uint32_t h = 0; h < NI; h++) {
            float d = m->k->dot_f32(q + (size_t)h * D, key, D) * scale;
            if (d > 0) s += w[h] * d;
        }
        if (filled == per && !(s > best[per - 1])) continue;
        uint32_t i = filled < per ? filled : per - 1; /* after every score >= s */
        while (i > 0 && best[i - 1] < s) {
            best[i] = best[i - 1];
            ids[i] = ids[i - 1];
            i--;
        }
        best[i] = s;
        ids[i] = (int32_t)j;
        if (filled < per) filled++;
    }
    for (uint32_t i = 1; i < per; i++) /* ascending pools: mla.c walks keys in order */
        for (uint32_t k = i; k > 0 && ids[k - 1] > ids[k]; k--) {
            int32_t tmp = ids[k];
            ids[k] = ids[k - 1];
            ids[k - 1] = tmp;
        }
    memcpy(sel, ids, per * sizeof(int32_t));
    m->idx_nsel[t] = (int32_t)per;
}

void wpi_dsa_index(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const uint32_t D = hp->index_head_dim, NI = hp->index_heads, P = hp->index_kpool;
    const size_t H = hp->hidden_size, RW = 3 * (size_t)D;
    float *rows = m->idx_cache + (size_t)L->idx_slot * m->ctx * RW;
    float *r0 = rows + (size_t)pos * RW;

    wpi_mm a[3] = {{&L->idx_k, r0, RW}, {&L->idx_gate, r0 + D, RW}, {&L->idx_w, m->idx_wt, NI}};
    wpi_matmul(m, a, 3, m->xn, H, n);
    wpi_mm b = {&L->idx_q, m->idx_q, (size_t)NI * D};
    wpi_matmul(m, &b, 1, m->mla_qa, hp->q_lora_rank, n);
    const float ws = 1.0f / sqrtf((float)NI);
    for (uint32_t t = 0; t < n; t++) {
        layer_norm(r0 + t * RW, D, L->idx_k_norm, L->idx_k_norm_b);
        for (uint32_t h = 0; h < NI; h++) m->idx_wt[(size_t)t * NI + h] *= ws;
        if ((pos + t + 1) % P == 0) pool_key(hp, L->idx_ape, rows, pos + t);
    }

    sel_ctx c = {m, rows, pos};
    uint64_t work = (uint64_t)n * ((pos + n) / P + 1) * NI * D;
    if (work < (1u << 15) || wpi_pool_threads(m->pool) <= 1) {
        for (uint32_t t = 0; t < n; t++) select_task(&c, t);
    } else {
        wpi_parallel_for(m->pool, n, select_task, &c);
    }
}

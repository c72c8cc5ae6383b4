/*
 * attention_sw.c -- grouped-query attention with a sliding window and attention sinks
 * (gpt_oss), over the same f32 KV cache as attention.c.
 *
 * h = x + o(attn(rmsnorm(x))) + bo: q/k/v projected with biases, RoPE (rotate_half on the
 * first rope_dim dims), then per (token, head) a causal softmax over the keys
 * max(0, p - window + 1) .. p (all keys when window is 0) plus one extra logit per head,
 * the sink, which takes probability mass but contributes no value:
 *   out = sum_j e^(s_j - M) v_j / (sum_j e^(s_j - M) + e^(sink_h - M)).
 * The cache keeps every position (the window only masks), so state save/load and the
 * memory plan are those of plain attention. Thread count never changes a result.
 */
#include <math.h>
#include <string.h>

#include "blocks.h"


typedef struct sw_ctx {
    const wpi_model *m;
    const float *kc, *vc;   /* this layer's cache, row 0 */
    const float *sinks;     /* [n_heads] or NULL */
    uint32_t pos, window;
} sw_ctx;

static void sw_task(void *arg, uint32_t task)
{
    const sw_ctx *a = arg;
    const wpi_model *m = a->m;
    const wpi_hparams *hp = m->hp;
    const uint32_t hd = hp->head_dim, t = task / hp->n_heads, h = task % hp->n_heads;
    const size_t qd = (size_t)hp->n_heads * hd, kvd = (size_t)hp->n_kv_heads * hd;
    const size_t kvh = h / (hp->n_heads / hp->n_kv_heads);
    const float *q = m->q + t * qd + (size_t)h * hd;
    const float *kc = a->kc + kvh * hd, *vc = a->vc + kvh * hd;
    float *out = m->att + t * qd + (size_t)h * hd;
    const uint32_t p = a->pos + t;
    const uint32_t lo = a->window && p + 1 > a->window ? p + 1 - a->window : 0;
    float mx;
    float sum = wpi_attend_keys(m, q, kc, vc, kvd, lo, p + 1, out, &mx);
    if (a->sinks) {
        const float sk = a->sinks[h];
        if (sk > mx) {
            float r = expf(mx - sk);
            sum = sum * r + 1.0f;
            for (uint32_t i = 0; i < hd; i++) out[i] *= r;
        } else {
            sum += expf(sk - mx);
        }
    }
    const float inv = 1.0f / sum;
    for (uint32_t i = 0; i < hd; i++) out[i] *= inv;
}

void wpi_attention_sw_attend(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos,
                             uint32_t window)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t hd = hp->head_dim, kvd = (size_t)hp->n_kv_heads * hd;
    const size_t layer_rows = (size_t)l * m->ctx;

    wpi_attention_store(m, l, n, pos);
    sw_ctx a = {m, m->kcache + layer_rows * kvd, m->vcache + layer_rows * kvd, L->sinks, pos,
                window};
    uint32_t tasks = n * hp->n_heads;
    uint64_t keys = window && pos + n > window ? window : pos + n;
    uint64_t work = (uint64_t)tasks * keys * hd * 2;
    if (work < (1u << 15)) {
        for (uint32_t i = 0; i < tasks; i++) sw_task(&a, i);
    } else {
        wpi_parallel_for(m->pool, tasks, sw_task, &a);
    }
}

void wpi_attention_sw_block(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos,
                            uint32_t window)
{
    wpi_attention_project(m, l, n);
    wpi_attention_sw_attend(m, l, n, pos, window);
    wpi_attention_output(m, l, n);
}

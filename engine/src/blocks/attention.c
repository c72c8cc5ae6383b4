/*
 * attention.c -- grouped-query attention over the f32 KV cache, with RoPE.
 *
 * One block: h = x + o(attn(rmsnorm(x))) over a chunk of tokens, in three parts so that a
 * batched step runs the stateless two over every sequence's rows at once: the projection
 * (q/k/v in one parallel matmul into q and kv_rows, then biases, q/k norm ("head" or
 * "full"), clip_qkv, and RoPE (HF rotate_half on the first rope_dim dims, cos and sin
 * scaled by rope_attn_factor, each row at its own position)); per sequence, k and v
 * copied into the cache rows at its positions and the attention over its cache; the
 * output projection into the residual stream. Each (sequence, token, head) is one task:
 * causal softmax in blocks of keys with a running maximum, so no buffer grows with the
 * context, and thread count never changes a result. A batched step's sequences share
 * one parallel section per layer (wpi_attention_attend_seqs): one fork-join, not one per
 * sequence, and a task's arithmetic is the same as with the sequence alone.
 */
#include <math.h>
#include <string.h>

#include "blocks.h"

#define KEY_BLOCK 256
#define HD_LOCAL 256 /* head widths up to this sum on the stack (attn_task) */

void wpi_rope_prepare(wpi_model *m, uint32_t n, uint32_t pos)
{
    const uint32_t half = m->hp->rope_dim / 2;
    const float f = m->hp->rope_attn_factor;
    for (uint32_t t = 0; t < n; t++) {
        for (uint32_t i = 0; i < half; i++) {
            /* The angle is rounded to f32 as PyTorch computes it (position * inv_freq). */
            float a = (float)(pos + t) * m->rope_freqs[i];
            m->rope_cos[t * half + i] = (float)cos((double)a) * f;
            m->rope_sin[t * half + i] = (float)sin((double)a) * f;
        }
    }
}

void wpi_rope_apply(float *v, uint32_t n_heads, uint32_t head_dim, uint32_t rope_dim,
                    const float *cos_, const float *sin_)
{
    const uint32_t half = rope_dim / 2;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * head_dim;
        for (uint32_t i = 0; i < half; i++) {
            float a = x[i], b = x[i + half];
            x[i] = a * cos_[i] - b * sin_[i];
            x[i + half] = b * cos_[i] + a * sin_[i];
        }
    }
}

static void clamp(float *v, size_t n, float lim)
{
    for (size_t i = 0; i < n; i++) v[i] = v[i] > lim ? lim : (v[i] < -lim ? -lim : v[i]);
}

static void add(float *y, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++) y[i] += b[i];
}

float wpi_attend_keys(const wpi_model *m, const float *q, const float *kc, const float *vc,
                      size_t kvd, uint32_t lo, uint32_t end, float *out, float *mx_out)
{
    const uint32_t hd = m->hp->head_dim;
    const float scale = m->hp->attn_scale;
    float s[KEY_BLOCK];
    float mx = -INFINITY, sum = 0;
    memset(out, 0, hd * sizeof(float));
    for (uint32_t j0 = lo; j0 < end; j0 += KEY_BLOCK) {
        uint32_t nb = end - j0 < KEY_BLOCK ? end - j0 : KEY_BLOCK;
        float bmax = -INFINITY;
        for (uint32_t j = 0; j < nb; j++) {
            s[j] = m->k->dot_f32(q, kc + (j0 + j) * kvd, hd) * scale;
            if (s[j] > bmax) bmax = s[j];
        }
        if (bmax > mx) {
            if (mx != -INFINITY) {
                float r = expf(mx - bmax);
                sum *= r;
                for (uint32_t i = 0; i < hd; i++) out[i] *= r;
            }
            mx = bmax;
        }
        for (uint32_t j = 0; j < nb; j++) {
            float e = expf(s[j] - mx);
            sum += e;
            m->k->axpy_f32(e, vc + (j0 + j) * kvd, out, hd);
        }
    }
    *mx_out = mx;
    return sum;
}

/* Sequences of one parallel section; a larger batch takes several sections. */
#define SEQS_PER_SECTION 64

/* One sequence of an attention section: its model (q and att rows, cache), this layer's
 * cache at row 0, its rows' first position, and its first task. */
typedef struct attn_seq {
    const wpi_model *m;
    const float *kc, *vc;
    uint32_t pos, first;
} attn_seq;

typedef struct attn_ctx {
    const attn_seq *s;
    uint32_t n_seqs, n_heads, window; /* window 0: every key */
    const float *sinks;               /* [n_heads] or NULL */
} attn_ctx;

/* Output of one (sequence, token, head): softmax(q k^T * scale) v over the keys
 * max(0, p - window + 1) .. p of its position p, with the head's sink when set. */
static void attn_task(void *arg, uint32_t task)
{
    const attn_ctx *a = arg;
    uint32_t i = 0;
    while (i + 1 < a->n_seqs && task >= a->s[i + 1].first) i++;
    const attn_seq *sq = &a->s[i];
    const wpi_model *m = sq->m;
    const wpi_hparams *hp = m->hp;
    const uint32_t local = task - sq->first;
    const uint32_t hd = hp->head_dim, t = local / a->n_heads, h = local % a->n_heads;
    const size_t qd = (size_t)hp->n_heads * hd, kvd = (size_t)hp->n_kv_heads * hd;
    const size_t kvh = h / (hp->n_heads / hp->n_kv_heads);
    const float *q = m->q + t * qd + (size_t)h * hd;
    const float *kc = sq->kc + kvh * hd, *vc = sq->vc + kvh * hd;
    float *dst = m->att + t * qd + (size_t)h * hd;
    /* The sum runs in a buffer of this thread's: att's rows were last read by the other
     * cores (the output projection's input), and a read-modify-write per key of lines
     * another core holds waits on each transfer. */
    _Alignas(64) float sum_buf[HD_LOCAL];
    float *out = hd <= HD_LOCAL ? sum_buf : dst;
    const uint32_t p = sq->pos + t;
    const uint32_t lo = a->window && p + 1 > a->window ? p + 1 - a->window : 0;
    float mx;
    float sum = wpi_attend_keys(m, q, kc, vc, kvd, lo, p + 1, out, &mx);
    if (a->sinks) {
        const float sk = a->sinks[h];
        if (sk > mx) {
            float r = expf(mx - sk);
            sum = sum * r + 1.0f;
            for (uint32_t k = 0; k < hd; k++) out[k] *= r;
        } else {
            sum += expf(sk - mx);
        }
    }
    const float inv = 1.0f / sum;
    for (uint32_t k = 0; k < hd; k++) dst[k] = out[k] * inv;
}

typedef struct project_ctx {
    const wpi_model *m;
    const wpi_layer *L;
} project_ctx;

/* Rows r0 .. r1 - 1 of the projection: biases, q/k norm, clip_qkv and RoPE in place. */
static void project_rows(void *arg, uint32_t r0, uint32_t r1)
{
    const project_ctx *c = arg;
    const wpi_model *m = c->m;
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = c->L;
    const size_t hd = hp->head_dim;
    const size_t qd = (size_t)hp->n_heads * hd, kvd = (size_t)hp->n_kv_heads * hd;
    float *kr = m->kv_rows, *vr = m->kv_rows + kvd; /* rows 2 * kvd apart */
    const uint32_t half = hp->rope_dim / 2;
    for (uint32_t t = r0; t < r1; t++) {
        float *q = m->q + t * qd, *k = kr + t * 2 * kvd, *v = vr + t * 2 * kvd;
        if (L->bq) add(q, L->bq, qd);
        if (L->bk) add(k, L->bk, kvd);
        if (L->bv) add(v, L->bv, kvd);
        if (hp->qk_norm == WPI_QK_HEAD) {
            for (uint32_t h = 0; h < hp->n_heads; h++)
                wpi_rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, hp->rms_norm_eps);
            for (uint32_t h = 0; h < hp->n_kv_heads; h++)
                wpi_rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, hp->rms_norm_eps);
        } else if (hp->qk_norm == WPI_QK_FULL) {
            wpi_rmsnorm(q, q, L->q_norm, qd, hp->rms_norm_eps);
            wpi_rmsnorm(k, k, L->k_norm, kvd, hp->rms_norm_eps);
        }
        if (hp->clip_qkv > 0) {
            clamp(q, qd, hp->clip_qkv);
            clamp(k, kvd, hp->clip_qkv);
            clamp(v, kvd, hp->clip_qkv);
        }
        if (half) { /* each row's own position: its sequence's slice of the tables */
            const float *cs = m->rope_cos + t * half, *sn = m->rope_sin + t * half;
            wpi_rope_apply(q, hp->n_heads, hd, hp->rope_dim, cs, sn);
            wpi_rope_apply(k, hp->n_kv_heads, hd, hp->rope_dim, cs, sn);
        }
    }
}

void wpi_attention_project(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, hd = hp->head_dim;
    const size_t qd = (size_t)hp->n_heads * hd, kvd = (size_t)hp->n_kv_heads * hd;
    float *kr = m->kv_rows, *vr = m->kv_rows + kvd; /* rows 2 * kvd apart */

    wpi_rmsnorm_rows(m, m->xn, m->x, L->attn_norm, H, n, hp->rms_norm_eps);
    wpi_mm qkv[3] = {{&L->wq, m->q, qd}, {&L->wk, kr, 2 * kvd}, {&L->wv, vr, 2 * kvd}};
    wpi_matmul(m, qkv, 3, m->xn, H, n);
    project_ctx c = {m, L};
    wpi_parallel_rows(m, n, qd + 2 * kvd, project_rows, &c);
}

void wpi_attention_store(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    const size_t kvd = (size_t)m->hp->n_kv_heads * m->hp->head_dim;
    const size_t at = (size_t)l * m->ctx + pos;
    for (uint32_t t = 0; t < n; t++) {
        memcpy(m->kcache + (at + t) * kvd, m->kv_rows + t * 2 * kvd, kvd * sizeof(float));
        memcpy(m->vcache + (at + t) * kvd, m->kv_rows + t * 2 * kvd + kvd, kvd * sizeof(float));
    }
}

typedef struct residual_ctx {
    wpi_model *m;
    const float *bias; /* or NULL */
} residual_ctx;

/* x += xn (+ bias) for rows r0 .. r1 - 1. */
static void residual_rows(void *arg, uint32_t r0, uint32_t r1)
{
    const residual_ctx *c = arg;
    const size_t H = c->m->hp->hidden_size;
    for (uint32_t t = r0; t < r1; t++) {
        if (c->bias) add(c->m->xn + t * H, c->bias, H);
        add(c->m->x + t * H, c->m->xn + t * H, H);
    }
}

void wpi_attention_output(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_layer *L = &m->layers[l];
    const size_t H = m->hp->hidden_size;
    const size_t qd = (size_t)m->hp->n_heads * m->hp->head_dim;

    wpi_mm o = {&L->wo, m->xn, H};
    wpi_matmul(m, &o, 1, m->att, qd, n);
    residual_ctx c = {m, L->bo};
    wpi_parallel_rows(m, n, H, residual_rows, &c);
}

void wpi_attention_attend_seqs(wpi_model *const *ms, uint32_t l, const uint32_t *n,
                               const uint32_t *pos, uint32_t n_seqs, uint32_t window,
                               int sinks)
{
    for (uint32_t s0 = 0; s0 < n_seqs; s0 += SEQS_PER_SECTION) {
        const uint32_t ns = n_seqs - s0 < SEQS_PER_SECTION ? n_seqs - s0 : SEQS_PER_SECTION;
        attn_seq seq[SEQS_PER_SECTION];
        const wpi_hparams *hp = ms[s0]->hp;
        const size_t kvd = (size_t)hp->n_kv_heads * hp->head_dim;
        uint32_t tasks = 0;
        uint64_t work = 0;
        for (uint32_t i = 0; i < ns; i++) {
            wpi_model *m = ms[s0 + i];
            const uint32_t ni = n[s0 + i], pi = pos[s0 + i];
            const size_t layer_rows = (size_t)l * m->ctx;
            wpi_attention_store(m, l, ni, pi);
            seq[i] = (attn_seq){m, m->kcache + layer_rows * kvd, m->vcache + layer_rows * kvd,
                                pi, tasks};
            const uint64_t keys = window && pi + ni > window ? window : pi + ni;
            tasks += ni * hp->n_heads;
            work += (uint64_t)ni * hp->n_heads * keys * hp->head_dim * 2;
        }
        attn_ctx a = {seq, ns, hp->n_heads, window, sinks ? ms[s0]->layers[l].sinks : NULL};
        if (work < (1u << 15)) {
            for (uint32_t i = 0; i < tasks; i++) attn_task(&a, i);
        } else {
            wpi_parallel_for(ms[s0]->pool, tasks, attn_task, &a);
        }
    }
}

void wpi_attention_attend(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_attention_attend_seqs(&m, l, &n, &pos, 1, 0, 0);
}

void wpi_attention_mixer_seqs(wpi_model *const *ms, uint32_t l, const uint32_t *n,
                              const uint32_t *pos, uint32_t n_seqs)
{
    wpi_attention_attend_seqs(ms, l, n, pos, n_seqs, 0, 0);
}

void wpi_attention_block(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_attention_project(m, l, n);
    wpi_attention_attend(m, l, n, pos);
    wpi_attention_output(m, l, n);
}

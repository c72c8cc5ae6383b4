/*
 * kda.c -- Kimi Delta Attention (kimi_linear's linear-attention layers), recurrent form.
 *
 * One block: h = x + o(gated_norm(kda(rmsnorm(x)))) over a chunk of n tokens, one token
 * at a time (the recurrent form; transformers' chunked prefill computes the same sums).
 * With D = kda_heads * d (d = kda_head_dim), per token:
 *   mixed = [Wq x | Wk x | Wv x]                          [3D]
 *   mixed = silu(causal depthwise conv over the last kda_conv inputs)
 *   q, k  = per-head l2norm (x / sqrt(sum x^2 + 1e-6)); q *= d^-1/2
 *   g     = -exp(A_log_h) * softplus(f_b f_a x + dt_bias)  [D]  (softplus(y) = y above 20)
 *           or, with kda_safe_gate (glm5_next), kda_lower_bound * sigmoid(exp(A_log_h) * y)
 *   beta  = sigmoid(b x)                                  [heads]
 *   per head: S = S * exp(g)[:, None]; delta = (v - S^T k) * beta;
 *             S += k delta^T; o = S^T q                  S: [d (k), d (v)]
 *   out   = Wo (rmsnorm_h(o_h; o_norm, rms_norm_eps) * sigmoid(g_b g_a x))
 *           or, with kda_full_gate (kimi_k3), sigmoid(g x) of one full-rank kda_g [D, H]
 * State per layer, constant in context (the memory plan's "recurrent state"):
 *   S [heads][d][d] then the conv window [kda_conv - 1][3D] (oldest first), f32.
 * At position 0 the state starts from zero. Heads are independent tasks, so the thread
 * count never changes a result. In three parts, so that a batched step runs the
 * stateless two over every sequence's rows at once: the projections (q/k/v, gates, beta),
 * per sequence the convolution and the recurrence through its state, and the gated norm
 * with the output projection.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "blocks.h"

uint64_t wpi_kda_state_floats(const wpi_hparams *hp)
{
    if (!hp->kda_heads) return 0;
    const uint64_t d = hp->kda_head_dim, D = (uint64_t)hp->kda_heads * d;
    return hp->kda_heads * d * d + (uint64_t)(hp->kda_conv - 1) * 3 * D;
}

uint32_t wpi_kda_layers(const wpi_hparams *hp)
{
    uint32_t n = 0;
    for (uint32_t l = 0; l < hp->n_layers; l++) n += hp->layer_attn[l] == WPI_ATTN_KDA;
    return n;
}

uint64_t wpi_kda_scratch_floats(const wpi_hparams *hp, uint32_t chunk)
{
    if (!hp->kda_heads) return 0;
    const uint64_t d = hp->kda_head_dim, D = (uint64_t)hp->kda_heads * d;
    /* mixed [3D], g [D], gate [D], o [D], fa [d], ga [d], beta [heads] per token */
    return (uint64_t)chunk * (6 * D + 2 * d + hp->kda_heads);
}

const char *wpi_kda_no_truncate(const wpi_hparams *hp)
{
    return wpi_kda_layers(hp) ? "a recurrent (KDA) state" : NULL;
}

typedef struct kda_ctx {
    const wpi_model *m;
    const wpi_layer *L;
    float *S;               /* [heads][d][d] */
    float *mixed, *g, *o, *beta; /* row 0 of each, rows `ld` floats apart */
    size_t ld;
    uint32_t n;
} kda_ctx;

/* A row's parts in kda_buf, rows row_floats() apart: mixed [3D], g [D], gate [D], o [D],
 * fa [d], ga [d], beta [heads], so a sequence's rows are one slice of the buffer. */
static size_t row_floats(const wpi_hparams *hp)
{
    return (size_t)wpi_kda_scratch_floats(hp, 1);
}

/* Head h over the chunk's tokens in order. */
static void head_task(void *arg, uint32_t h)
{
    const kda_ctx *a = arg;
    const wpi_hparams *hp = a->m->hp;
    const uint32_t d = hp->kda_head_dim, nh = hp->kda_heads;
    const size_t D = (size_t)nh * d;
    const float scale = 1.0f / sqrtf((float)d);
    const float decay = expf(a->L->kda_a_log[h]);
    float *S = a->S + (size_t)h * d * d;
    float q[WPI_KDA_MAX_HEAD_DIM], k[WPI_KDA_MAX_HEAD_DIM], delta[WPI_KDA_MAX_HEAD_DIM];
    for (uint32_t t = 0; t < a->n; t++) {
        const float *mx = a->mixed + t * a->ld;
        const float *qi = mx + (size_t)h * d, *ki = mx + D + (size_t)h * d;
        const float *vi = mx + 2 * D + (size_t)h * d;
        const float *gi = a->g + t * a->ld + (size_t)h * d;
        float sq = 0, sk = 0;
        for (uint32_t i = 0; i < d; i++) {
            sq += qi[i] * qi[i];
            sk += ki[i] * ki[i];
        }
        const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
        for (uint32_t i = 0; i < d; i++) {
            q[i] = qi[i] * iq * scale;
            k[i] = ki[i] * ik;
        }
        /* S *= exp(g) per key row; kv_mem = S^T k */
        for (uint32_t j = 0; j < d; j++) delta[j] = 0;
        for (uint32_t i = 0; i < d; i++) {
            float y = gi[i], e;
            if (hp->kda_safe_gate) { /* glm5_next: g = lower_bound * sigmoid(exp(A_log) y) */
                e = expf(hp->kda_lower_bound / (1.0f + expf(-decay * y)));
            } else {
                float sp = y > 20.0f ? y : logf(1.0f + expf(y));
                e = expf(-decay * sp);
            }
            float *row = S + (size_t)i * d;
            for (uint32_t j = 0; j < d; j++) {
                row[j] *= e;
                delta[j] += row[j] * k[i];
            }
        }
        const float b = a->beta[t * a->ld + h];
        for (uint32_t j = 0; j < d; j++) delta[j] = (vi[j] - delta[j]) * b;
        float *o = a->o + t * a->ld + (size_t)h * d;
        for (uint32_t j = 0; j < d; j++) o[j] = 0;
        for (uint32_t i = 0; i < d; i++) {
            float *row = S + (size_t)i * d;
            for (uint32_t j = 0; j < d; j++) {
                row[j] += k[i] * delta[j];
                o[j] += row[j] * q[i];
            }
        }
    }
}

void wpi_kda_project(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, S = row_floats(hp);
    const uint32_t d = hp->kda_head_dim, nh = hp->kda_heads;
    const size_t D = (size_t)nh * d;
    float *mixed = m->kda_buf, *g = mixed + 3 * D, *gate = g + D;
    float *fa = gate + 2 * D, *ga = fa + d, *beta = ga + d;

    for (uint32_t t = 0; t < n; t++)
        wpi_rmsnorm(m->xn + t * H, m->x + t * H, L->attn_norm, H, hp->rms_norm_eps);
    const int full = L->kda_g.data != NULL;
    wpi_mm in[6] = {{&L->wq, mixed, S},      {&L->wk, mixed + D, S},
                    {&L->wv, mixed + 2 * D, S}, {&L->kda_f_a, fa, S},
                    {&L->kda_b, beta, S},
                    full ? (wpi_mm){&L->kda_g, gate, S} : (wpi_mm){&L->kda_g_a, ga, S}};
    wpi_matmul(m, in, 3, m->xn, H, n);
    wpi_matmul(m, in + 3, 3, m->xn, H, n);
    wpi_mm up[2] = {{&L->kda_f_b, g, S}, {&L->kda_g_b, gate, S}};
    wpi_matmul(m, up, 1, fa, S, n);
    if (!full) wpi_matmul(m, up + 1, 1, ga, S, n);
    for (uint32_t t = 0; t < n; t++) {
        for (size_t i = 0; i < D; i++) g[t * S + i] += L->kda_dt_bias[i];
        for (uint32_t h = 0; h < nh; h++)
            beta[t * S + h] = 1.0f / (1.0f + expf(-beta[t * S + h]));
    }
}

void wpi_kda_attend(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t S = row_floats(hp);
    const uint32_t d = hp->kda_head_dim, nh = hp->kda_heads, K = hp->kda_conv;
    const size_t D = (size_t)nh * d;
    float *St = m->kda_state + (size_t)L->kv_slot * wpi_kda_state_floats(hp);
    float *conv = St + (size_t)nh * d * d; /* [K-1][3D], oldest first */
    float *mixed = m->kda_buf, *g = mixed + 3 * D, *o = g + 2 * D, *beta = o + D + 2 * d;

    if (pos == 0) memset(St, 0, wpi_kda_state_floats(hp) * sizeof(float));
    /* short convolution + silu, token by token through the window */
    const size_t C3 = 3 * D;
    for (uint32_t t = 0; t < n; t++) {
        float *x = mixed + t * S;
        for (size_t c = 0; c < C3; c++) {
            const float *w = L->kda_conv + c * K;
            float s = w[K - 1] * x[c];
            for (uint32_t i = 0; i + 1 < K; i++) s += w[i] * conv[i * C3 + c];
            /* shift the window: drop the oldest, append this input */
            for (uint32_t i = 0; i + 2 < K; i++) conv[i * C3 + c] = conv[(i + 1) * C3 + c];
            if (K > 1) conv[(size_t)(K - 2) * C3 + c] = x[c];
            x[c] = s / (1.0f + expf(-s));
        }
    }

    kda_ctx a = {m, L, St, mixed, g, o, beta, S, n};
    if ((uint64_t)n * nh * d * d < (1u << 14) || wpi_pool_threads(m->pool) <= 1) {
        for (uint32_t h = 0; h < nh; h++) head_task(&a, h);
    } else {
        wpi_parallel_for(m->pool, nh, head_task, &a);
    }
}

void wpi_kda_output(wpi_model *m, uint32_t l, uint32_t n)
{
    const wpi_hparams *hp = m->hp;
    const wpi_layer *L = &m->layers[l];
    const size_t H = hp->hidden_size, S = row_floats(hp);
    const uint32_t d = hp->kda_head_dim, nh = hp->kda_heads;
    const size_t D = (size_t)nh * d;
    float *gate = m->kda_buf + 4 * D, *o = gate + D;

    /* gated per-head RMSNorm, then the output projection */
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t h = 0; h < nh; h++) {
            float *oh = o + t * S + (size_t)h * d;
            const float *gh = gate + t * S + (size_t)h * d;
            wpi_rmsnorm(oh, oh, L->kda_o_norm, d, hp->rms_norm_eps);
            for (uint32_t i = 0; i < d; i++) oh[i] *= 1.0f / (1.0f + expf(-gh[i]));
        }
    wpi_mm out = {&L->wo, m->xn, H};
    wpi_matmul(m, &out, 1, o, S, n);
    for (uint32_t t = 0; t < n; t++) {
        float *x = m->x + t * H;
        const float *y = m->xn + t * H;
        for (size_t i = 0; i < H; i++) x[i] += y[i];
    }
}

void wpi_kda_block(wpi_model *m, uint32_t l, uint32_t n, uint32_t pos)
{
    wpi_kda_project(m, l, n);
    wpi_kda_attend(m, l, n, pos);
    wpi_kda_output(m, l, n);
}

wp_status wpi_kda_check_layer(const wpi_container *c, uint32_t l, char *err, size_t cap)
{
    const wpi_hparams *hp = &c->hp;
    const uint64_t H = hp->hidden_size, d = hp->kda_head_dim, D = hp->kda_heads * d;
    char n[96];
#define NAME(s) (snprintf(n, sizeof n, "blk.%u." s, l), n)
    TRY(wpi_need_matrix(c, NAME("attn_q.weight"), D, H, err, cap));
    TRY(wpi_need_matrix(c, NAME("attn_k.weight"), D, H, err, cap));
    TRY(wpi_need_matrix(c, NAME("attn_v.weight"), D, H, err, cap));
    TRY(wpi_need_matrix(c, NAME("attn_output.weight"), H, D, err, cap));
    TRY(wpi_need_matrix(c, NAME("kda_f_a.weight"), d, H, err, cap));
    TRY(wpi_need_matrix(c, NAME("kda_f_b.weight"), D, d, err, cap));
    TRY(wpi_need_matrix(c, NAME("kda_b.weight"), hp->kda_heads, H, err, cap));
    if (hp->kda_full_gate) {
        TRY(wpi_need_matrix(c, NAME("kda_g.weight"), D, H, err, cap));
    } else {
        TRY(wpi_need_matrix(c, NAME("kda_g_a.weight"), d, H, err, cap));
        TRY(wpi_need_matrix(c, NAME("kda_g_b.weight"), D, d, err, cap));
    }
    TRY(wpi_need_vector(c, NAME("kda_conv.weight"), 3 * D * hp->kda_conv, err, cap));
    TRY(wpi_need_vector(c, NAME("kda_dt_bias"), D, err, cap));
    TRY(wpi_need_vector(c, NAME("kda_a_log"), hp->kda_heads, err, cap));
    TRY(wpi_need_vector(c, NAME("kda_o_norm.weight"), d, err, cap));
#undef NAME
    return WP_OK;
}

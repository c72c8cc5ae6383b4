/*
 * hyper.c -- manifold-constrained hyper-connections (mHC), as transformers'
 * DeepseekV4HyperConnection / DeepseekV4HyperHead (reused by glm5_next).
 *
 * The residual of a token is hc streams of dim floats, x[hc][dim] (contiguous). Before a
 * block (attention or MLP) the streams are collapsed into the block's input; after it the
 * block's output is expanded back and added to a mix of the input streams:
 *
 *   mix  = fn . (x / rms(x))                       fn [(2 + hc) * hc, hc * dim], f32
 *   pre  = sigmoid(mix[0:hc] * scale[0] + base[0:hc]) + hc_eps
 *   post = 2 sigmoid(mix[hc:2hc] * scale[1] + base[hc:2hc])
 *   comb = softmax_rows(mix[2hc:] * scale[2] + base[2hc:]) + hc_eps      [hc][hc]
 *          then Sinkhorn: columns normalized once, then (rows, columns) iters - 1 times,
 *          each sum + hc_eps in the denominator
 *   in   = sum_k pre[k] x[k]                                             (wpi_hc_pre)
 *   x'[k] = post[k] * out + sum_j comb[j][k] x[j]                        (wpi_hc_post)
 *
 * rms(v) = sqrt(mean(v^2) + norm_eps) over all hc * dim floats (an unweighted RMSNorm).
 * The head (wpi_hc_head) collapses the streams once at the end:
 *   y = sum_k (sigmoid(fn_k . (x / rms(x)) * scale[0] + base[k]) + hc_eps) x[k]
 * or, without fn, the plain mean of the streams (glm5_next).
 *
 * Since the norm is a per-token scalar, fn . (x / r) is computed as (fn . x) / r: one f32
 * matmul over the raw streams, no normalized copy. Work is split over the pool by rows
 * of fn (the mixes) and by tokens (the rest), so thread count never changes a result.
 */
#include <math.h>
#include <string.h>

#include "blocks.h"

#define COL_BLOCK 256 /* columns of x' computed on the stack at once in wpi_hc_post */

uint32_t wpi_hc_mix_count(const wpi_hc_dims *d)
{
    return (2 + d->hc) * d->hc;
}

wpi_hc_dims wpi_hc_dims_of(const wpi_hparams *hp)
{
    wpi_hc_dims d = {hp->hc_mult, hp->hidden_size, hp->hc_sinkhorn_iters, hp->hc_eps,
                     hp->rms_norm_eps};
    return d;
}

void wpi_hc_expand(const wpi_hc_dims *d, const float *x, uint32_t n, float *streams)
{
    const size_t H = d->dim;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t k = 0; k < d->hc; k++)
            memcpy(streams + ((size_t)t * d->hc + k) * H, x + t * H, H * sizeof(float));
}

uint64_t wpi_hc_scratch_floats(const wpi_hc_dims *d, uint32_t n)
{
    return (uint64_t)n * (wpi_hc_mix_count(d) + 1);
}

static float sigmoidf_(float v)
{
    return 1.0f / (1.0f + expf(-v));
}

/* 1 / sqrt(mean(v^2) + eps) over n floats (accumulated in double). */
static float inv_rms(const float *v, size_t n, float eps)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)v[i] * v[i];
    return (float)(1.0 / sqrt((double)(float)(s / (double)n) + (double)eps));
}

/* ---- mixes: mix[t][r] = (fn_r . x_t) * inv_rms(x_t) -------------------------------- */

typedef struct mix_ctx {
    const wpi_kernels *k;
    const float *fn, *x;
    size_t cols;
    uint32_t rows, n;
    float *mix;  /* [n][rows] */
    float *irms; /* [n] */
} mix_ctx;

static void mix_task(void *arg, uint32_t task)
{
    const mix_ctx *c = arg;
    c->k->matmul_f32(c->fn, c->cols, task, task + 1, c->x, c->cols, c->n, c->mix, c->rows);
}

/* Fills mix [n][rows] and irms [n] (irms already applied to mix). */
static void compute_mixes(const wpi_kernels *k, wpi_pool *pool, const wpi_hc_dims *d,
                          const float *fn, uint32_t rows, const float *x, uint32_t n,
                          float *mix, float *irms)
{
    const size_t cols = (size_t)d->hc * d->dim;
    mix_ctx c = {k, fn, x, cols, rows, n, mix, irms};
    wpi_parallel_for(pool, rows, mix_task, &c);
    for (uint32_t t = 0; t < n; t++) {
        irms[t] = inv_rms(x + (size_t)t * cols, cols, d->norm_eps);
        for (uint32_t r = 0; r < rows; r++) mix[(size_t)t * rows + r] *= irms[t];
    }
}

/* ---- pre: weights and the collapsed input ------------------------------------------ */

typedef struct pre_ctx {
    const wpi_hc_dims *d;
    const float *base, *scale, *x, *mix;
    float *post, *comb, *collapsed;
    size_t ldc;
} pre_ctx;

static void pre_task(void *arg, uint32_t t)
{
    const pre_ctx *c = arg;
    const uint32_t hc = c->d->hc, dim = c->d->dim, R = wpi_hc_mix_count(c->d);
    const float eps = c->d->hc_eps;
    const float *m = c->mix + (size_t)t * R;
    const float *x = c->x + (size_t)t * hc * dim;
    float pre[WPI_HC_MAX];
    for (uint32_t k = 0; k < hc; k++) pre[k] = sigmoidf_(m[k] * c->scale[0] + c->base[k]) + eps;
    float *post = c->post + (size_t)t * hc;
    for (uint32_t k = 0; k < hc; k++)
        post[k] = 2.0f * sigmoidf_(m[hc + k] * c->scale[1] + c->base[hc + k]);
    float *cb = c->comb + (size_t)t * hc * hc;
    for (uint32_t j = 0; j < hc; j++) {
        float *row = cb + (size_t)j * hc;
        for (uint32_t k = 0; k < hc; k++)
            row[k] = m[2 * hc + j * hc + k] * c->scale[2] + c->base[2 * hc + j * hc + k];
        wpi_softmax(row, hc);
        for (uint32_t k = 0; k < hc; k++) row[k] += eps;
    }
    /* Sinkhorn-Knopp: columns, then iters - 1 times rows and columns. */
    for (uint32_t it = 0; it < c->d->sinkhorn_iters; it++) {
        if (it > 0) {
            for (uint32_t j = 0; j < hc; j++) {
                float s = 0.0f;
                for (uint32_t k = 0; k < hc; k++) s += cb[j * hc + k];
                s += eps;
                for (uint32_t k = 0; k < hc; k++) cb[j * hc + k] /= s;
            }
        }
        for (uint32_t k = 0; k < hc; k++) {
            float s = 0.0f;
            for (uint32_t j = 0; j < hc; j++) s += cb[j * hc + k];
            s += eps;
            for (uint32_t j = 0; j < hc; j++) cb[j * hc + k] /= s;
        }
    }
    if (c->collapsed) {
        float *y = c->collapsed + (size_t)t * c->ldc;
        for (uint32_t i = 0; i < dim; i++) {
            float s = 0.0f;
            for (uint32_t k = 0; k < hc; k++) s += pre[k] * x[(size_t)k * dim + i];
            y[i] = s;
        }
    }
}

void wpi_hc_pre(const wpi_kernels *k, wpi_pool *pool, const wpi_hc_dims *d,
                const float *fn, const float *base, const float *scale,
                const float *x, uint32_t n, float *post, float *comb,
                float *collapsed, size_t ldc, float *scratch)
{
    const uint32_t R = wpi_hc_mix_count(d);
    float *mix = scratch, *irms = scratch + (size_t)n * R;
    compute_mixes(k, pool, d, fn, R, x, n, mix, irms);
    pre_ctx c = {d, base, scale, x, mix, post, comb, collapsed, ldc};
    wpi_parallel_for(pool, n, pre_task, &c);
}

/* ---- post: x'[k] = post[k] out + sum_j comb[j][k] x[j] ----------------------------- */

typedef struct post_ctx {
    const wpi_hc_dims *d;
    float *x;
    const float *out, *post, *comb;
    size_t ldo;
} post_ctx;

static void post_task(void *arg, uint32_t t)
{
    const post_ctx *c = arg;
    const uint32_t hc = c->d->hc, dim = c->d->dim;
    float *x = c->x + (size_t)t * hc * dim;
    const float *o = c->out + (size_t)t * c->ldo;
    const float *post = c->post + (size_t)t * hc;
    const float *cb = c->comb + (size_t)t * hc * hc;
    float buf[WPI_HC_MAX * COL_BLOCK];
    for (uint32_t i0 = 0; i0 < dim; i0 += COL_BLOCK) {
        uint32_t w = dim - i0 < COL_BLOCK ? dim - i0 : COL_BLOCK;
        for (uint32_t k = 0; k < hc; k++) {
            float *b = buf + (size_t)k * COL_BLOCK;
            for (uint32_t i = 0; i < w; i++) {
                float s = 0.0f;
                for (uint32_t j = 0; j < hc; j++) s += cb[j * hc + k] * x[(size_t)j * dim + i0 + i];
                b[i] = post[k] * o[i0 + i] + s;
            }
        }
        for (uint32_t k = 0; k < hc; k++)
            memcpy(x + (size_t)k * dim + i0, buf + (size_t)k * COL_BLOCK, sizeof(float) * w);
    }
}

void wpi_hc_post(wpi_pool *pool, const wpi_hc_dims *d, float *x, const float *out,
                 size_t ldo, const float *post, const float *comb, uint32_t n)
{
    post_ctx c = {d, x, out, post, comb, ldo};
    wpi_parallel_for(pool, n, post_task, &c);
}

/* ---- head: y = sum_k w[k] x[k] ------------------------------------------------------ */

void wpi_hc_head(const wpi_kernels *k, wpi_pool *pool, const wpi_hc_dims *d,
                 const float *fn, const float *base, const float *scale,
                 const float *x, uint32_t n, float *y, size_t ldy, float *scratch)
{
    const uint32_t hc = d->hc, dim = d->dim;
    float *mix = scratch, *irms = scratch + (size_t)n * hc;
    if (fn) compute_mixes(k, pool, d, fn, hc, x, n, mix, irms);
    for (uint32_t t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * hc * dim;
        float *yt = y + (size_t)t * ldy;
        float w[WPI_HC_MAX];
        for (uint32_t s = 0; s < hc; s++)
            w[s] = fn ? sigmoidf_(mix[(size_t)t * hc + s] * scale[0] + base[s]) + d->hc_eps : 1.0f;
        for (uint32_t i = 0; i < dim; i++) {
            float s = 0.0f;
            for (uint32_t j = 0; j < hc; j++) s += w[j] * xt[(size_t)j * dim + i];
            yt[i] = fn ? s : s / (float)hc;
        }
    }
}

/*
 * vision.c -- the pieces of a ViT image tower that the towers share (kimi_k25's MoonViT,
 * and as K3 ships it, kimi_k25.c; glm5_next's; what differs in the options of
 * wpi_vit_opts): layer norm with bias, GELU (exact or
 * tanh), linear layers with bias, the 2D rotary table of a patch grid and the
 * bidirectional pre-norm encoder layer.
 *
 * Tensors of encoder layer l (the "v.*" trunk tensors, loaded only for a context opened
 * with the vision option), A the attention width (attn_hidden_size, D unless set):
 * v.blk.l.ln1.{weight,bias} [D], v.blk.l.attn_qkv.{weight [3A, D], bias [3A]} (q, k, v one
 * after another; q and k rotate in pairs (2j, 2j+1) by angle j, the checkpoint's
 * interleaved layout, or with rope_half in pairs (j, j + hd/2)),
 * v.blk.l.attn_out.{weight [D, A], bias [D]}, v.blk.l.ln2.{weight,bias} [D],
 * v.blk.l.ffn_up.{weight [F, D], bias [F]}, v.blk.l.ffn_down.{weight [D, F], bias [D]};
 * with rms_norm the norms have no bias, with qk_norm v.blk.l.attn_{q,k}_norm.weight [hd],
 * with glu v.blk.l.ffn_gate.{weight [F, D], bias [F]}, with biases_optional any bias may
 * be absent.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "blocks.h"

void wpi_layernorm(float *out, const float *x, const float *w, const float *b, size_t n,
                   float eps)
{
    double mean = 0, var = 0;
    for (size_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    for (size_t i = 0; i < n; i++) {
        const double d = x[i] - mean;
        var += d * d;
    }
    const float inv = (float)(1.0 / sqrt(var / (double)n + eps)), mu = (float)mean;
    for (size_t i = 0; i < n; i++) out[i] = (x[i] - mu) * inv * w[i] + b[i];
}

float wpi_gelu(float x, int act)
{
    if (act == WPI_ACT_GELU_TANH) {
        const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
        return 0.5f * x * (1.0f + tanhf(k * (x + 0.044715f * x * x * x)));
    }
    return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
}

void wpi_vit_linear(wpi_model *m, const wpi_wmat *w, const float *bias, const float *x,
                    size_t ldx, uint32_t n, float *y, size_t ldy)
{
    wpi_mm job = {w, y, ldy};
    wpi_matmul(m, &job, 1, x, ldx, n);
    if (bias)
        for (uint32_t t = 0; t < n; t++)
            for (uint32_t r = 0; r < w->rows; r++) y[(size_t)t * ldy + r] += bias[r];
}

void wpi_vit_rope_table(const uint32_t *row, const uint32_t *col, uint32_t n, uint32_t head_dim,
                        float theta, int layout, float *cos_out, float *sin_out)
{
    const uint32_t half = head_dim / 2, quarter = head_dim / 4;
    for (uint32_t t = 0; t < n; t++)
        for (uint32_t j = 0; j < half; j++) {
            uint32_t i;
            int on_col;
            if (layout == WPI_VIT_ROPE_ROWS_COLS) {
                i = j < quarter ? j : j - quarter;
                on_col = j >= quarter;
            } else {
                i = j / 2;
                on_col = (j % 2 == 0) == (layout == WPI_VIT_ROPE_COL_ROW);
            }
            const float inv = 1.0f / powf(theta, (float)(2 * i) / (float)(head_dim / 2));
            const float ang = (float)(on_col ? col[t] : row[t]) * inv;
            cos_out[(size_t)t * half + j] = cosf(ang);
            sin_out[(size_t)t * half + j] = sinf(ang);
        }
}

/* A block of VIT_QUERY_BLOCK patches of one head of the encoder's attention: online
 * softmax over every patch, by blocks of VIT_KEY_BLOCK keys. The tasks run head-major and
 * each key block serves the whole query block while it is in cache: the working set is
 * one head's keys and values, not every head's (patch-major tasks read all of [n, 3D] per
 * query, which stops fitting the caches as n grows). Each query sees the same operations
 * in the same order as it would alone. */
typedef struct vit_attn {
    const wpi_model *m;
    const float *qkv;
    float *out;
    uint32_t n, heads, hd, A; /* A: the attention width, heads * hd */
    float scale;
} vit_attn;

#define VIT_KEY_BLOCK 64
#define VIT_QUERY_BLOCK 8

static uint32_t vit_query_blocks(uint32_t n)
{
    return (n + VIT_QUERY_BLOCK - 1) / VIT_QUERY_BLOCK;
}

static void vit_attn_task(void *arg, uint32_t task)
{
    const vit_attn *a = arg;
    const uint32_t nqb = vit_query_blocks(a->n), h = task / nqb, hd = a->hd;
    const uint32_t t0 = (task % nqb) * VIT_QUERY_BLOCK;
    const uint32_t nq = a->n - t0 < VIT_QUERY_BLOCK ? a->n - t0 : VIT_QUERY_BLOCK;
    const size_t ld = 3 * (size_t)a->A;
    const float *kc = a->qkv + a->A + (size_t)h * hd, *vc = a->qkv + 2 * (size_t)a->A + h * hd;
    float s[VIT_KEY_BLOCK];
    float mx[VIT_QUERY_BLOCK], sum[VIT_QUERY_BLOCK];
    for (uint32_t q = 0; q < nq; q++) {
        mx[q] = -INFINITY;
        sum[q] = 0;
        memset(a->out + (size_t)(t0 + q) * a->A + (size_t)h * hd, 0, hd * sizeof(float));
    }
    for (uint32_t j0 = 0; j0 < a->n; j0 += VIT_KEY_BLOCK) {
        const uint32_t nb = a->n - j0 < VIT_KEY_BLOCK ? a->n - j0 : VIT_KEY_BLOCK;
        for (uint32_t q = 0; q < nq; q++) {
            const float *qv = a->qkv + (t0 + q) * ld + (size_t)h * hd;
            float *out = a->out + (size_t)(t0 + q) * a->A + (size_t)h * hd;
            float bmax = -INFINITY;
            for (uint32_t j = 0; j < nb; j++) {
                s[j] = a->m->k->dot_f32(qv, kc + (j0 + j) * ld, hd) * a->scale;
                if (s[j] > bmax) bmax = s[j];
            }
            if (bmax > mx[q]) {
                if (mx[q] != -INFINITY) {
                    const float r = expf(mx[q] - bmax);
                    sum[q] *= r;
                    for (uint32_t i = 0; i < hd; i++) out[i] *= r;
                }
                mx[q] = bmax;
            }
            for (uint32_t j = 0; j < nb; j++) {
                const float e = expf(s[j] - mx[q]);
                sum[q] += e;
                a->m->k->axpy_f32(e, vc + (j0 + j) * ld, out, hd);
            }
        }
    }
    for (uint32_t q = 0; q < nq; q++) {
        float *out = a->out + (size_t)(t0 + q) * a->A + (size_t)h * hd;
        const float inv = 1.0f / sum[q];
        for (uint32_t i = 0; i < hd; i++) out[i] *= inv;
    }
}

static void rotate_pairs(float *v, uint32_t heads, uint32_t hd, const float *cs, const float *sn,
                         int half)
{
    const uint32_t step = half ? 1 : 2, other = half ? hd / 2 : 1;
    for (uint32_t h = 0; h < heads; h++) {
        float *x = v + (size_t)h * hd;
        for (uint32_t j = 0; j < hd / 2; j++) {
            float *pa = x + j * step, *pb = pa + other;
            const float a = *pa, b = *pb;
            *pa = a * cs[j] - b * sn[j];
            *pb = b * cs[j] + a * sn[j];
        }
    }
}

static void vit_norm(const wpi_vit_opts *o, float *out, const float *x, const float *w,
                     const float *b, size_t n, float eps)
{
    if (o->rms_norm)
        wpi_rmsnorm(out, x, w, n, eps);
    else
        wpi_layernorm(out, x, w, b, n, eps);
}

/* The towers that merge m x m blocks of patches into one row: h / m * w / m rows. */
uint32_t wpi_vit_merged_rows(const wpi_vision_hp *v, const uint32_t thw[3], const char *arch,
                             char *err, size_t cap)
{
    const uint32_t m = v->merge_size;
    if (thw[0] != 1) {
        wpi_fail(err, cap, WP_E_ARG, "%s: grid t is %u; only images (t = 1) are encoded", arch,
                 thw[0]);
        return 0;
    }
    if (thw[1] == 0 || thw[2] == 0 || thw[1] % m || thw[2] % m) {
        wpi_fail(err, cap, WP_E_ARG,
                 "%s: grid %u x %u is not a positive multiple of the merge size %u", arch,
                 thw[1], thw[2], m);
        return 0;
    }
    return thw[1] / m * (thw[2] / m);
}

#define VNAME(s) (snprintf(nm, sizeof nm, "v.blk.%u." s, l), nm)

wp_status wpi_vit_check_layer(const wpi_container *c, const wpi_vit_opts *o, uint32_t l,
                              char *err, size_t cap)
{
    const wpi_vision_hp *v = &c->vhp;
    const uint64_t D = v->hidden_size, F = v->intermediate_size, A = v->attn_hidden_size;
    const uint64_t hd = A / v->n_heads;
    char nm[64];
#define BIAS(s, n)                                                                    \
    TRY(o->biases_optional ? wpi_opt_vector(c, VNAME(s), n, err, cap)                \
                           : wpi_need_vector(c, VNAME(s), n, err, cap))
    TRY(wpi_need_vector(c, VNAME("ln1.weight"), D, err, cap));
    TRY(wpi_need_vector(c, VNAME("ln2.weight"), D, err, cap));
    if (!o->rms_norm) {
        TRY(wpi_need_vector(c, VNAME("ln1.bias"), D, err, cap));
        TRY(wpi_need_vector(c, VNAME("ln2.bias"), D, err, cap));
    }
    TRY(wpi_need_matrix(c, VNAME("attn_qkv.weight"), 3 * A, D, err, cap));
    BIAS("attn_qkv.bias", 3 * A);
    TRY(wpi_need_matrix(c, VNAME("attn_out.weight"), D, A, err, cap));
    BIAS("attn_out.bias", D);
    if (o->qk_norm) {
        TRY(wpi_need_vector(c, VNAME("attn_q_norm.weight"), hd, err, cap));
        TRY(wpi_need_vector(c, VNAME("attn_k_norm.weight"), hd, err, cap));
    }
    if (o->glu) {
        TRY(wpi_need_matrix(c, VNAME("ffn_gate.weight"), F, D, err, cap));
        BIAS("ffn_gate.bias", F);
    }
    TRY(wpi_need_matrix(c, VNAME("ffn_up.weight"), F, D, err, cap));
    BIAS("ffn_up.bias", F);
    TRY(wpi_need_matrix(c, VNAME("ffn_down.weight"), D, F, err, cap));
    BIAS("ffn_down.bias", D);
#undef BIAS
    return WP_OK;
}

void wpi_vit_layer(wpi_model *m, const wpi_container *c, const wpi_vit_opts *o, uint32_t l,
                   const wpi_vit_buf *b, uint32_t n)
{
    const wpi_vision_hp *v = &c->vhp;
    const uint32_t D = v->hidden_size, F = v->intermediate_size, H = v->n_heads;
    const uint32_t A = v->attn_hidden_size, hd = A / H;
    char nm[64];
#define VEC(s) wpi_bind_vec(c, VNAME(s), 0)
    const float *w1 = VEC("ln1.weight"), *b1 = VEC("ln1.bias");
    for (uint32_t t = 0; t < n; t++)
        vit_norm(o, b->xn + (size_t)t * D, b->x + (size_t)t * D, w1, b1, D, v->norm_eps);
    wpi_wmat w = wpi_bind_mat(c, VNAME("attn_qkv.weight"), 0);
    wpi_vit_linear(m, &w, VEC("attn_qkv.bias"), b->xn, D, n, b->qkv, 3 * (size_t)A);
    const float *qn = o->qk_norm ? VEC("attn_q_norm.weight") : NULL;
    const float *kn = o->qk_norm ? VEC("attn_k_norm.weight") : NULL;
    for (uint32_t t = 0; t < n; t++) {
        const float *cs = b->cos + (size_t)t * (hd / 2), *sn = b->sin + (size_t)t * (hd / 2);
        float *q = b->qkv + (size_t)t * 3 * A, *k = q + A;
        if (o->qk_norm)
            for (uint32_t h = 0; h < H; h++) {
                wpi_rmsnorm(q + h * hd, q + h * hd, qn, hd, v->norm_eps);
                wpi_rmsnorm(k + h * hd, k + h * hd, kn, hd, v->norm_eps);
            }
        rotate_pairs(q, H, hd, cs, sn, o->rope_half);
        rotate_pairs(k, H, hd, cs, sn, o->rope_half);
    }
    vit_attn a = {m, b->qkv, b->att, n, H, hd, A, 1.0f / sqrtf((float)hd)};
    wpi_parallel_for(m->pool, vit_query_blocks(n) * H, vit_attn_task, &a);
    w = wpi_bind_mat(c, VNAME("attn_out.weight"), 0);
    wpi_vit_linear(m, &w, VEC("attn_out.bias"), b->att, A, n, b->xn, D);
    for (size_t i = 0; i < (size_t)n * D; i++) b->x[i] += b->xn[i];
    const float *w2 = VEC("ln2.weight"), *b2 = VEC("ln2.bias");
    for (uint32_t t = 0; t < n; t++)
        vit_norm(o, b->xn + (size_t)t * D, b->x + (size_t)t * D, w2, b2, D, v->norm_eps);
    w = wpi_bind_mat(c, VNAME("ffn_up.weight"), 0);
    wpi_vit_linear(m, &w, VEC("ffn_up.bias"), b->xn, D, n, b->ff, F);
    if (o->glu) {
        float *g = b->ff + (size_t)n * F; /* ff holds [2n, F] with glu */
        w = wpi_bind_mat(c, VNAME("ffn_gate.weight"), 0);
        wpi_vit_linear(m, &w, VEC("ffn_gate.bias"), b->xn, D, n, g, F);
        const float lim = o->glu_limit;
        for (size_t i = 0; i < (size_t)n * F; i++) {
            float gi = g[i], ui = b->ff[i];
            if (lim > 0) {
                gi = gi > lim ? lim : gi;
                ui = ui > lim ? lim : ui < -lim ? -lim : ui;
            }
            b->ff[i] = gi / (1.0f + expf(-gi)) * ui;
        }
    } else {
        for (size_t i = 0; i < (size_t)n * F; i++) b->ff[i] = wpi_gelu(b->ff[i], v->act);
    }
    w = wpi_bind_mat(c, VNAME("ffn_down.weight"), 0);
    wpi_vit_linear(m, &w, VEC("ffn_down.bias"), b->ff, F, n, b->xn, D);
    for (size_t i = 0; i < (size_t)n * D; i++) b->x[i] += b->xn[i];
#undef VEC
}

#undef VNAME
